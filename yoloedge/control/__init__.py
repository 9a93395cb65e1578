"""The control socket: the daemon's server side and the client `yoloedge-ctl` uses."""
