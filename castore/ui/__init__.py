"""`castore ui`: a web page for the person on call, over one store (the optional extra
castore[ui]): the tasks by state, one task's timeline, plan, brief and resolve commands, and
the alerts `castore watch` raises, live.

Read-only unless started with resolution allowed; then a resolve runs the `castore resolve`
the server was given (the CLI's own path, its audit record and its messages), behind a token.

Modules, one job each: reading, taskview, lgview (what the pages show, read from the store);
board (the alerts: `castore watch --json`, run as a command of its own); guard (who may do
what); pages (Jinja2's only importer); app (Starlette's only importer); server (uvicorn's only
importer). `import castore` and the CLI's parser never load this package.

May import: castore.store, castore.chain, castore.run and what is below them, castore.langgraph
for a LangGraph thread's names; never castore.cli (it runs `castore watch` as a command).
"""
