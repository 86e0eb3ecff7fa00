"""The viewer page's HTML, CSS and script, shipped as package data (a package of its own so that
setuptools lists it instead of warning that `packages` leaves it out)."""
