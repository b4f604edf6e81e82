"""Storage: the vector stores and the gate, the SQL registry, the warehouse."""
