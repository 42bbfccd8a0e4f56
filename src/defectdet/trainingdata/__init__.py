"""Training input (torch): the training dataset and its collate, augmentation, mosaic, batch previews.

Built on the torch-free `defectdet.data` (readers, image IO, letterbox, registration), which the torch-free
runtime shares; the runtime never imports this package. `augment_config` (the augmentation settings) imports
neither torch nor albumentations, so a training configuration reads without them.
"""
