"""What tests share: slow oracles, small pipelines and corpora, tiny framework models, an S3 server."""
