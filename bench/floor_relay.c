/* The floor of bench_proxy.py, compiled: a port forward from 127.0.0.1:LISTEN to
 * 127.0.0.1:TARGET. Threads made at start each accept a connection, connect to the target and
 * move whatever either side sends with blocking calls (poll, recv, send) until both sides
 * have ended: nothing is parsed, judged or logged. It shows what the second loopback
 * connection of any relay costs on the machine, without an interpreter's own cost.
 *
 *     cc -O2 -pthread -o floor_relay floor_relay.c && ./floor_relay LISTEN TARGET
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define THREADS 16 /* more than the clients at once */
#define BUFFER (4 << 20) /* as the Python floor's, and the proxy's bulk buffer (relay.BULK) */

static int listener, target;

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return address;
}

static void relay(int client, int upstream, char *buffer) {
    struct pollfd ends[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
    int open_ends = 2;
    while (open_ends > 0 && poll(ends, 2, -1) > 0) {
        for (int i = 0; i < 2; i++) {
            if (ends[i].fd < 0 || !ends[i].revents)
                continue;
            int other = i ? client : upstream;
            ssize_t n = recv(ends[i].fd, buffer, BUFFER, 0);
            if (n <= 0) {
                shutdown(other, SHUT_WR);
                ends[i].fd = -1;
                open_ends--;
                continue;
            }
            for (ssize_t sent = 0, w; sent < n; sent += w)
                if ((w = send(other, buffer + sent, n - sent, MSG_NOSIGNAL)) <= 0)
                    return;
        }
    }
}

static void *serve(void *unused) {
    int one = 1;
    struct sockaddr_in to = loopback(target);
    char *buffer = malloc(BUFFER);
    if (buffer == NULL)
        return unused;
    for (;;) {
        int client = accept(listener, NULL, NULL);
        if (client < 0)
            continue;
        int upstream = socket(AF_INET, SOCK_STREAM, 0);
        if (upstream >= 0 && connect(upstream, (struct sockaddr *)&to, sizeof to) == 0) {
            setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            relay(client, upstream, buffer);
        }
        close(client);
        if (upstream >= 0)
            close(upstream);
    }
    return unused;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s LISTEN-PORT TARGET-PORT\n", argv[0]);
        return 2;
    }
    int one = 1;
    target = atoi(argv[2]);
    struct sockaddr_in at = loopback(atoi(argv[1]));
    listener = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(listener, (struct sockaddr *)&at, sizeof at) || listen(listener, 1024)) {
        perror("floor_relay");
        return 1;
    }
    pthread_t thread;
    for (int i = 0; i < THREADS; i++)
        pthread_create(&thread, NULL, serve, NULL);
    pause();
    return 0;
}
