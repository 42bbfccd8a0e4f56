"""Data in: dataset readers, robust image IO, letterbox, augmentation, torch datasets."""
