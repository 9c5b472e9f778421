"""Recording loopback stand-ins for the services the workflows call: Teams Workflows webhooks
(teams.py), Azure Resource Manager (arm.py), the App Service managed-identity token endpoint
(identity.py) and Blob storage for the heartbeat store (storage.py). Each binds 127.0.0.1 on
port 0, runs in a thread, and has start()/stop()."""
