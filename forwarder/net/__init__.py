"""One way to call a peer with a deadline and one way to serve HTTP on the VM."""
