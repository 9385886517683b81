# Sourced by the bench/*.sh scripts: free ports and waiting for a server.
# Needs $py, a Python.

# port prints a free TCP port of 127.0.0.1.
port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_port PORT waits up to 10 s for something to listen on 127.0.0.1:PORT.
wait_port() { for i in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; return 1; }
