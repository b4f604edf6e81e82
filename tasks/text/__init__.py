"""Text shared by every pipeline: chunking, the BM25 analyser and sparse vectors, the MiniLM
embedder, chunk points (what the vector store keeps) and PII scrubbing."""
