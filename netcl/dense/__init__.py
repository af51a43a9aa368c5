"""Dense pixelwise inference and training with d-regularly sparse kernels (Li, Zhao & Wang).

    dense = nc.dense.convert(patch_classifier, patch_size)   # (N, C, H, W) -> (N, K, H, W) scores
    nc.dense.scan_patches(patch_classifier, image, pixels)    # the patch-by-patch reference, (P, K)
    loss = nc.dense.masked_cross_entropy(dense(x), labels, mask)   # Section 4.3: train on chosen pixels

See docs/howto/dense-labelling.md.
"""
from .convert import DenseModel, convert, infer_patch_size
from .loss import masked_cross_entropy
from .patches import all_pixels, crop_patches, scan_patches

__all__ = ["convert", "DenseModel", "scan_patches", "crop_patches", "all_pixels", "infer_patch_size",
           "masked_cross_entropy"]
