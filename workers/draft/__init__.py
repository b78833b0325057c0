"""The draft worker: the drafting algorithm and the draft models it can run."""
