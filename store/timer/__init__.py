"""The 5.x timer wheel: ``timerwheel`` slots, ``timerlog`` units, and the timer service."""
