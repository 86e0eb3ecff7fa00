"""The retriever: served load and latency, encoders, retrieval quality, index and start-up at scale."""
