"""The worker processes: one draft model, one target model, each in its own process.

They know nothing of the scheduler's code; they answer ipc.messages.
"""
