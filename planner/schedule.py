"""The prefetch schedule, defined once in ``schemas.schedule`` (the contract with the runtime)."""

from schemas.schedule import Trigger, num_slots, schedule

__all__ = ["Trigger", "num_slots", "schedule"]
