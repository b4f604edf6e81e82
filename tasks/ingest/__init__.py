"""The ingest pipeline: discover sources, sniff their format, extract text in isolated workers
(OCR, speech), check the chunks and index them (registry + vectors, one servable version)."""
