"""The benchmarks: each module is one command, run from the repository root as `python -m bench.<name>`
(`python -m bench` lists the suites). They import each other and the shared helpers through this package."""
