"""Realtime sessions: text streams in over a WebSocket while speech streams out.

A session is a job that stays open (`Job.realtime`). It goes through the same
admission, queues, priorities and quota as any job; what differs is where its
text comes from:

    client ──WebSocket──▶ web (`socket`): messages checked (`messages`), text
                          reserved as it arrives (`sessions`)
                          ──▶ the session's input stream in Redis (`channel`)
    GPU worker (`runner`): reads the input stream, speaks each context's text in
                          units (`schedule`), appends audio to the job's stream
                          (`synthesis.stream_protocol`, chunks carry their context)
    web relays the audio and each context's `said` back to the client.

The protocol the client speaks is documented in docs/api/realtime.md.
"""
