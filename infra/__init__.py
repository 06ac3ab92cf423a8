"""The infrastructure under the services: the bus (connect, streams, serving), reading the
log, blobs, the SQLite projection, KV buckets, the secret registry file, the process runtime."""
