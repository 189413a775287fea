"""Process plumbing shared by every envrl process: spawning and watching children, parent-death
signals, loopback checks, HTTP calls with deadlines, atomic publishing. Nothing here imports
torch or vLLM, so a child can set up its lifeline before anything slow is imported."""
