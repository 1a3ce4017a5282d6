"""Proxmox VE: its API (token, SSH), guests as inventory, guest config backups."""
