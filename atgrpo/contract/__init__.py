"""The contract between the services: the plain types two services exchange, and their protobuf
converters (the `*_wire` modules). It sits below every service, so that a service meets another
only through that service's client and these types (DESIGN.md §3); the types modules import no
protobuf, so pure code (atgrpo.algo, environments) can use them."""
