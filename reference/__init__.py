"""colibri.reference: the plain-numpy engine that defines correct behaviour."""
