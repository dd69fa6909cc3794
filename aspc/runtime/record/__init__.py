"""Recording a run: the recorder (an observer of the run loop), the run log, resume checks, metrics."""
