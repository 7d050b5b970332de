"""The application: command line, service composition, logging, demo, bench, the Gym entry."""
