"""STAND-IN FOR TESTS, not the real CosyVoice package: see cli/cosyvoice.py."""
