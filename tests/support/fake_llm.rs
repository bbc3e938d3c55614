//! A scripted OpenAI-compatible server (filled in with the agent).
