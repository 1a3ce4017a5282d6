"""The Plan's guests: which GPU goes to whom, container and VM configs, power around a change."""
