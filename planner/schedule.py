"""The prefetch schedule, defined once in ``schemas.schedule`` (the contract with the runtime)."""

from schemas.schedule import DEFAULT_PREFETCH_STEP, Trigger, num_slots, schedule

__all__ = ["DEFAULT_PREFETCH_STEP", "Trigger", "num_slots", "schedule"]
