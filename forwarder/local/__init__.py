"""Actions on the VM itself: the hooks file, journal, runner and worker, the drain probe,
and Prepared."""
