"""Store groups: several stores read and written as one."""
