from pathlib import Path

# Transcripts recorded from the reference Disque server (1.0-rc1); see its README.md.
REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
