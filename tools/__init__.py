"""The offline converter from PyTorch checkpoints to .qrt files (needs torch; see docs/CONVERTER.md)."""
