"""Generated protobuf/gRPC stubs: run `make protos`, never edit."""
