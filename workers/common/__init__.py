"""What every worker process does around its model: the command loop, pinning."""
