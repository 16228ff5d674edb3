"""Delayed messages (``delayed/``): what the 4.x delay levels and the 5.x timer wheel share.

* :mod:`~store.delayed.delivery`: the real topic and queue a delayed message is routed to, the
  delivery headroom, the origins that make delivery exactly-once across crashes;
* :mod:`~store.delayed.restore`: the vectorised restore of due records into their real topics;
* :mod:`~store.delayed.delay_levels`: the 4.x delay levels (``SCHEDULE_TOPIC_XXXX``).

The timer wheel's own service is :mod:`store.timer.timer_service`.
"""
