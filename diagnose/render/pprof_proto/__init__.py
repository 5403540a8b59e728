"""pprof's profile.proto (github.com/google/pprof, proto/profile.proto at b9395ee, Apache-2.0: LICENSE
beside it) and the module protoc 35.1 (grpcio-tools 1.85.1) generated from it, for protobuf 7:
    python -m grpc_tools.protoc -I. --python_out=. profile.proto"""
