"""Command-line entry points: `yoloedge` (detect, bench, ...) and `yoloedge-ctl`."""
