"""colibri.server: the Tornado HTTP gateway; talks to engines only through the wire protocol."""
