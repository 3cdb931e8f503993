"""Pure parsers from fetched files to typed records (no Ansible, no network)."""
