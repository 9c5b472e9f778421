"""What reports on the forwarder: health, metrics, status.json and `sebridge status`, systemd."""
