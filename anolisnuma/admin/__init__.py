"""What the running daemon can be asked: the admin socket (``anolisnuma-ctl``) and the
Prometheus metrics endpoint. Both only read the daemon's state; neither is ever on the
path of a CRI call."""
