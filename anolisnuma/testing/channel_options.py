"""gRPC options that make grpcio peers behave like the real ones (grpc-go: the kubelet and
containerd): 16 KiB frames, 64 KiB initial windows, no window auto-tuning by BDP probing."""

MIB = 1 << 20

GO_LIKE_SERVER = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65535)]

CLIENT_OPTIONS = [
    ("grpc.max_receive_message_length", 16 * MIB),
    ("grpc.max_send_message_length", 16 * MIB),
    # Quick reconnects, but no grpc.min_reconnect_backoff_ms: grpc core takes it as the time a
    # connection has to get the server's SETTINGS (20 s by default, as grpc-go's), and at 50 ms
    # a loaded machine failed calls with "timed out before receiving SETTINGS frame".
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 200),
    ("grpc.enable_retries", 0),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.max_frame_size", 16384),
]
