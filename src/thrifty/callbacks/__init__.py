"""Callbacks: behaviour a user adds at a run's named moments, with no edit to the loop.

Subclass `Callback`, override the events it needs, and pass it as `Trainer(...,
callbacks=[...])`; see `thrifty.callbacks.base` for the events and their order.
"""

from thrifty.callbacks.base import Callback, StepEnd
from thrifty.callbacks.events import Callbacks

__all__ = ["Callback", "Callbacks", "StepEnd"]
