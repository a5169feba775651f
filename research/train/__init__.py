"""Training: TrainState, optimizer and schedules, pure steps, the loop."""
