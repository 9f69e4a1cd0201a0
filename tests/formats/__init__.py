"""The data layer: each format read against its own library's reader, discovery, integrity, object storage."""
