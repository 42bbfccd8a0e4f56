"""The shell commands of README.md and docs/getting-started/ work as written: every ```bash block runs, command
by command, and a command that fails (non-zero exit) fails the test.

The blocks of one page run in order, in one temporary folder that holds, before the first block, what the pages
call the reader's files (`PREPARED`): `line3/` (`defectdet synth line3` with 8 small boards and their templates),
`board.jpg` and `golden.jpg` (a board and its template), `incoming/*.jpg` and `golden/` (boards and their
templates by file name); for the good-parts-only guide `good_parts/` (defect-free surfaces), `new_parts/` (two of
them with a defect) and `reviewed/` (the review page's download after an operator accepted boxes as "scratch"). `defectdet` is the one of this environment. Each command runs in bash with `pipefail`,
`$CHECKOUT` (the repository root) and `$PORT` (a free port on 127.0.0.1) set.

The text of a command is never changed silently. What makes it short or safe here is written in the page, in
HTML comments (invisible on the rendered page) right above the block, one rule per comment:

- `<!-- test: "TEXT" -> "OTHER" -->`: every TEXT of the block becomes OTHER (a shorter time budget, fewer
  boards, `make -n` for a make target, `$PORT` for a fixed port); TEXT must occur in the block.
- `<!-- test: in the checkout -->`: the block runs in the repository root instead of the temporary folder.
- `<!-- test: background -->`: the block's first command runs in the background (a service); the others run
  once it accepts connections on `$PORT`, then it is stopped.
- `<!-- test: output has "TEXT" -->`: the block's commands together print TEXT.
- `<!-- test: may exit N -->`: a command of the block may also exit with N (a verdict such as compare's "keep
  OLD", not a failure).
- `<!-- test: skip: REASON -->`: the block does not run (REASON is required).

Pages whose commands train, serve or run the demo are marked `slow` (`pytest -m "not slow"` leaves them out).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs" / "getting-started").glob("*.md")),
    ROOT / "docs" / "guides" / "good-parts-only.md",
]
_BLOCK = re.compile(r"^```(?:bash|sh)[ \t]*\n(.*?)^```", re.S | re.M)
_MARKER = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->[ \t]*$")
_REPLACE = re.compile(r'^"(.+?)"\s*->\s*"(.*?)"$')
_OUTPUT = re.compile(r'^output has "(.+)"$')
_EXIT = re.compile(r"^may exit (\d+)$")
SLOW_COMMANDS = re.compile(r"^defectdet (train|demo|serve)\b", re.M)
COMMAND_TIMEOUT_S = 300
SERVICE_START_S = 90


@dataclass
class Block:
    """A ```bash block of a page, its rules, and the commands it runs after the rules' replacements."""

    page: str
    line: int
    text: str
    rules: list[str] = field(default_factory=list)
    replacements: list[tuple[str, str]] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)
    in_checkout: bool = False
    exit_codes: set[int] = field(default_factory=lambda: {0})
    background: bool = False
    skip: str | None = None

    def commands(self) -> list[str]:
        """The block's commands as they run: continuation lines joined, comment-only and blank lines left out,
        each replacement applied (one that matches nothing is an error: the page changed under its rule)."""
        text = self.text
        for old, new in self.replacements:
            if old not in text:
                raise AssertionError(f"{self.page}:{self.line}: the rule's text {old!r} is not in the block")
            text = text.replace(old, new)
        joined = re.sub(r"[ \t]*\\\n\s*", " ", text)
        return [
            line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
        ]


def _apply_rule(block: Block, rule: str) -> None:
    if replace := _REPLACE.match(rule):
        block.replacements.append((replace.group(1), replace.group(2)))
    elif output := _OUTPUT.match(rule):
        block.expected.append(output.group(1))
    elif code := _EXIT.match(rule):
        block.exit_codes.add(int(code.group(1)))
    elif rule == "in the checkout":
        block.in_checkout = True
    elif rule == "background":
        block.background = True
    elif rule.startswith("skip:") and rule[len("skip:") :].strip():
        block.skip = rule[len("skip:") :].strip()
    else:
        raise AssertionError(f"{block.page}:{block.line}: unknown test rule {rule!r}")
    block.rules.append(rule)


def shell_blocks(text: str, page: str = "page") -> list[Block]:
    """The ```bash (or ```sh) blocks of a Markdown text with the test rules in the comments right above each."""
    blocks = []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        block = Block(page, line, match.group(1))
        above = text[: match.start()].splitlines()
        rules = []
        while above and (_MARKER.match(above[-1].strip()) or not above[-1].strip()):
            marker = _MARKER.match(above.pop().strip())
            if marker:
                rules.insert(0, marker.group(1))
        for rule in rules:
            _apply_rule(block, rule)
        blocks.append(block)
    return blocks


def test_the_rules_above_a_block_are_read() -> None:
    text = (
        'x\n<!-- test: "--time 20" -> "--time 0.05" -->\n<!-- test: background -->\n\n```bash\n'
        "# a comment\ndefectdet train a \\\n  --time 20 --out r   # trains\n\n```\n\ntext\n```bash\nls\n```\n"
        "<!-- test: skip: needs the line's camera -->\n```sh\ncapture\n```\n"
        "<!-- test: may exit 1 -->\n```bash\ndefectdet compare a b c\n```\n"
    )
    first, second, third, fourth = shell_blocks(text)
    assert first.exit_codes == {0} and fourth.exit_codes == {0, 1}
    assert first.rules == ['"--time 20" -> "--time 0.05"', "background"] and first.background
    assert first.commands() == ["defectdet train a --time 0.05 --out r   # trains"]
    assert second.rules == [] and second.commands() == ["ls"]
    assert third.skip == "needs the line's camera"
    with pytest.raises(AssertionError, match="unknown test rule"):
        shell_blocks("<!-- test: quickly -->\n```bash\nls\n```\n")
    with pytest.raises(AssertionError, match="not in the block"):
        shell_blocks('<!-- test: "--epochs 9" -> "--epochs 1" -->\n```bash\nls\n```\n')[0].commands()


def test_every_page_has_commands_and_every_rule_matches() -> None:
    """Each page's blocks parse, each replacement finds its text, and the pages hold the commands this test is
    for (a page that lost its blocks would pass vacuously)."""
    commands = []
    for page in PAGES:
        for block in shell_blocks(page.read_text("utf-8"), _name(page)):
            commands += block.commands()
    for expected in (
        "make install",
        "defectdet check",
        "defectdet train",
        "defectdet val",
        "defectdet predict",
    ):
        assert any(expected in command for command in commands), expected
    assert any(command.startswith("curl") for command in commands)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _slow(page: Path) -> bool:
    return bool(SLOW_COMMANDS.search(page.read_text("utf-8")))


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reader's files the pages name: line3/ (synthetic boards with templates), board.jpg and golden.jpg,
    incoming/*.jpg with their templates in golden/."""
    import cv2

    from defectdet.data.formats import load_dataset
    from defectdet.data.synth import synthesize_dataset

    folder = tmp_path_factory.mktemp("prepared")
    data = synthesize_dataset(folder / "line3", boards=8, seed=0, template=True, min_size=160, max_size=224)
    (folder / "incoming").mkdir()
    (folder / "golden").mkdir()
    samples = load_dataset(data, "val").samples
    for sample in samples:
        name = f"{Path(sample.image_path).stem}.jpg"
        for source, target in ((sample.image_path, folder / "incoming" / name), (sample.template_path, folder / "golden" / name)):  # fmt: skip
            assert cv2.imwrite(str(target), cv2.imread(str(source), cv2.IMREAD_UNCHANGED))
    shutil.copy(folder / "incoming" / name, folder / "board.jpg")
    shutil.copy(folder / "golden" / name, folder / "golden.jpg")
    _good_parts(folder)
    return folder


def _good_parts(folder: Path) -> None:
    """good_parts/ (8 defect-free surfaces), new_parts/ (2 defect-free, 2 with a bright patch) and reviewed/:
    6 parts with a patch, each accepted on the review page as "scratch" (what its download unpacks to)."""
    import cv2

    from defectdet.data.synth import generate_surface
    from defectdet.serve.review import ReviewFolder

    def part(index: int, shift: int | None):
        """A surface; with `shift`, a bright 24 x 20 patch `shift` pixels right of (24, 24)."""
        image = generate_surface(7, index, 96, 96, materials=("cast",), clean=True).clean.copy()
        if shift is not None:
            image[24:44, 24 + shift : 48 + shift] = 255
        return image

    for sub in ("good_parts", "new_parts", "reviewed/images"):
        (folder / sub).mkdir(parents=True)
    for index in range(8):
        cv2.imwrite(str(folder / "good_parts" / f"good_{index}.png"), part(index, None))
    for index in range(4):
        cv2.imwrite(
            str(folder / "new_parts" / f"part_{index}.png"), part(20 + index, 8 if index >= 2 else None)
        )
    review = ReviewFolder(folder / "reviewed", ["anomaly", "scratch"], "olga")
    for index in range(6):
        shift = index % 3 * 8
        cv2.imwrite(str(folder / "reviewed" / "images" / f"kept_{index}.png"), part(40 + index, shift))
        box = [24 + shift, 24, 48 + shift, 44]
        review.decide(f"kept_{index}.png", "accept", [{"class_id": 1, "box": box}])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environment(port: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update({"CHECKOUT": str(ROOT), "PORT": str(port), "MPLBACKEND": "Agg", "NO_COLOR": "1"})
    return env


def _run(command: str, cwd: Path, env: dict[str, str], where: str, exit_codes: set[int] | None = None) -> str:
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert done.returncode in (exit_codes or {0}), (
        f"{where}: `{command}` exited with {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _start_service(command: str, cwd: Path, env: dict[str, str], where: str) -> subprocess.Popen:
    """The command in its own process group, once it accepts connections on $PORT."""
    service = subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + SERVICE_START_S
    while time.monotonic() < deadline:
        if service.poll() is not None:
            raise AssertionError(
                f"{where}: `{command}` exited with {service.returncode}\n{service.stdout.read()}"
            )
        try:
            with socket.create_connection(("127.0.0.1", int(env["PORT"])), timeout=1):
                return service
        except OSError:
            time.sleep(0.5)
    _stop(service)
    raise AssertionError(f"{where}: `{command}` did not answer on port {env['PORT']} in {SERVICE_START_S} s")


def _stop(service: subprocess.Popen) -> None:
    if service.poll() is None:
        os.killpg(service.pid, signal.SIGTERM)
        try:
            service.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait(timeout=20)


def _run_block(block: Block, folder: Path) -> None:
    where = f"{block.page}:{block.line}"
    env = _environment(_free_port())
    cwd = ROOT if block.in_checkout else folder
    commands = block.commands()
    service = _start_service(commands.pop(0), cwd, env, where) if block.background else None
    try:
        printed = "".join(_run(command, cwd, env, where, block.exit_codes) for command in commands)
    finally:
        if service is not None:
            _stop(service)
    for text in block.expected:
        assert text in printed, f"{where}: the commands did not print {text!r}:\n{printed[-3000:]}"


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=[pytest.mark.slow] if _slow(page) else []) for page in PAGES],
    ids=_name,
)
def test_the_commands_of_a_page_work_as_written(page: Path, prepared: Path, tmp_path: Path) -> None:
    folder = tmp_path / "work"
    shutil.copytree(prepared, folder)
    blocks = shell_blocks(page.read_text("utf-8"), _name(page))
    assert blocks, f"{_name(page)} has no ```bash block"
    for block in blocks:
        if block.skip is None:
            _run_block(block, folder)
