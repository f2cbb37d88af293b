"""What placers read and what scores them: the compiled ``Problem`` (with its merged ``edges``
and ``extend``), ``Schedule``, the device sets (``device_spec``) and the discrete-event
simulator (``simulate``; its loops in Python in ``sim_loops`` and in C in ``_simcore``)."""
