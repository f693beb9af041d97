"""Every benchmark of the paper as a ``TaskSpec``; importing this package registers them all."""

from cblight.data.tasks import (  # noqa: F401
    agnews,
    arc,
    copa,
    csqa,
    dstc7,
    hellaswag,
    lama,
    lambada,
    openbookqa,
    piqa,
    sst,
    storycloze,
    summarization,
    superglue,
    trec,
    webtext,
)
