"""The app layer: everything that wires the core, tasks and analyses together."""
