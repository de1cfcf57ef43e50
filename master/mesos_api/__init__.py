"""Apache Mesos' v1 scheduler HTTP API on the master's HTTP port, so that Mesos
frameworks (pymesos, and the Go, Java and C++ clients) run unmodified.

    endpoint.py       POST /api/v1/scheduler: status codes, SUBSCRIBE streams, calls
    calls.py          each call -> the master core (the same methods as gRPC frameworks)
    convert.py        Mesos v1 protobuf <-> mesolite's domain types, in one place
    wire.py           JSON (protos' field names) and protobuf bodies; bounds on calls
    recordio.py       `<length>\\n<record>` framing of the event stream
    media.py          Content-Type and Accept
    subscriptions.py  open streams, their Mesos-Stream-Id, and held idle connections

The protobuf types are mesolite's copy of the Mesos subset it speaks
(protos/mesolite/v1/mesos/, the same names and numbers as Mesos').
"""
