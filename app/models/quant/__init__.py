"""Quantized checkpoints: one backend-neutral form (affine.py) and a reader per file format."""

from lantern.app.models.quant.affine import AffineWeight, Fp8Weight, quantize_affine, requantize

__all__ = ["AffineWeight", "Fp8Weight", "quantize_affine", "requantize"]
