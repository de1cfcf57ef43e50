/* The supervisor's exec helper (agent/_supervisor.py): what its /bin/sh shim and
 * setpriv do, in one exec.
 *
 *     spawn_shim DIR... -- [UID GID GROUPS] -- COMMAND...
 *
 * Into each DIR's cgroup.procs it writes "0" (this process); then, given UID, GID and
 * GROUPS (comma-separated group ids, or an empty argument for none), it becomes that
 * user: setgroups, setgid, setuid, in that order, and checks the real and effective
 * ids after. Only then does it write "PID\n" to fd 3 (it is confined: the supervisor
 * tells the agent the command is ready), close fd 3 and execvp COMMAND. If it cannot
 * join a cgroup or become the user it writes "PID REASON\n" to fd 3 and exits 127
 * (the command never runs). No allocation: everything is on the stack.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define REPORT_FD 3
#define NOT_CONFINED 127
#define MAX_GROUPS 65536

static char pid_text[24];

static size_t put(char *out, size_t at, size_t size, const char *text) {
    while (*text && at + 1 < size) out[at++] = *text++;
    out[at] = '\0';
    return at;
}

static size_t put_number(char *out, size_t at, size_t size, unsigned long value) {
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + value % 10);
        value /= 10;
    } while (value);
    while (n && at + 1 < size) out[at++] = digits[--n];
    out[at] = '\0';
    return at;
}

static int write_all(int fd, const char *data, size_t size) {
    while (size) {
        ssize_t n = write(fd, data, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        data += n;
        size -= (size_t)n;
    }
    return 0;
}

/* "PID REASON: ERRNO\n" on fd 3, then exit 127. */
static void fail(const char *reason, const char *subject, int error) {
    char line[PATH_MAX + 256];
    size_t at = put(line, 0, sizeof line, pid_text);
    at = put(line, at, sizeof line, " ");
    at = put(line, at, sizeof line, reason);
    at = put(line, at, sizeof line, subject);
    if (error) {
        at = put(line, at, sizeof line, " (errno ");
        at = put_number(line, at, sizeof line, (unsigned long)error);
        at = put(line, at, sizeof line, ")");
    }
    at = put(line, at, sizeof line, "\n");
    write_all(REPORT_FD, line, at);
    _exit(NOT_CONFINED);
}

/* A decimal id that fits in an id_t (no sign, no blank, not empty); -1 if not. */
static int parse_id(const char *text, const char *end, unsigned int *out) {
    unsigned long value = 0;
    if (text == end) return -1;
    for (; text < end; text++) {
        if (*text < '0' || *text > '9') return -1;
        value = value * 10 + (unsigned long)(*text - '0');
        if (value >= (unsigned long)(unsigned int)-1) return -1; /* (id_t)-1 is no id */
    }
    *out = (unsigned int)value;
    return 0;
}

static void join(const char *directory) {
    char path[PATH_MAX];
    size_t at = put(path, 0, sizeof path, directory);
    at = put(path, at, sizeof path, "/cgroup.procs");
    if (at + 1 >= sizeof path) fail("cannot join the cgroup ", directory, ENAMETOOLONG);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot join the cgroup ", directory, errno);
    if (write_all(fd, "0", 1) != 0) fail("cannot join the cgroup ", directory, errno);
    if (close(fd) != 0 && errno != EINTR) fail("cannot join the cgroup ", directory, errno);
}

static void become(const char *uid_text, const char *gid_text, const char *groups_text) {
    unsigned int uid, gid;
    gid_t groups[MAX_GROUPS];
    size_t count = 0;
    if (parse_id(uid_text, uid_text + strlen(uid_text), &uid) != 0)
        fail("cannot become the user: a bad uid ", uid_text, 0);
    if (parse_id(gid_text, gid_text + strlen(gid_text), &gid) != 0)
        fail("cannot become the user: a bad gid ", gid_text, 0);
    for (const char *at = groups_text; *at;) {
        const char *end = strchrnul(at, ',');
        unsigned int group;
        if (count == MAX_GROUPS || parse_id(at, end, &group) != 0)
            fail("cannot become the user: bad groups ", groups_text, 0);
        groups[count++] = (gid_t)group;
        at = *end ? end + 1 : end;
    }
    if (setgroups(count, groups) != 0) fail("cannot set the groups ", groups_text, errno);
    if (setgid((gid_t)gid) != 0) fail("cannot set the gid ", gid_text, errno);
    if (setuid((uid_t)uid) != 0) fail("cannot set the uid ", uid_text, errno);
    if (getuid() != uid || geteuid() != uid || getgid() != gid || getegid() != gid)
        fail("did not become the user ", uid_text, 0);
}

int main(int argc, char **argv) {
    int i = 1;
    put_number(pid_text, 0, sizeof pid_text, (unsigned long)getpid());
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) join(argv[i]);
    if (i == argc) fail("was given no command: ", "no --", 0);
    int user = ++i;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
    }
    if (i == argc || i + 1 == argc) fail("was given no command: ", "no second --", 0);
    if (i - user == 3)
        become(argv[user], argv[user + 1], argv[user + 2]);
    else if (i - user != 0)
        fail("was given a user that is not UID GID GROUPS", "", 0);
    char ready[32];
    size_t at = put(ready, 0, sizeof ready, pid_text);
    at = put(ready, at, sizeof ready, "\n");
    if (write_all(REPORT_FD, ready, at) != 0) _exit(NOT_CONFINED);
    close(REPORT_FD);
    char **command = argv + i + 1;
    execvp(command[0], command);
    int error = errno;
    char line[PATH_MAX + 128];
    at = put(line, 0, sizeof line, "mesolite spawn shim: cannot execute ");
    at = put(line, at, sizeof line, command[0]);
    at = put(line, at, sizeof line, " (errno ");
    at = put_number(line, at, sizeof line, (unsigned long)error);
    at = put(line, at, sizeof line, ")\n");
    write_all(2, line, at);
    _exit(error == ENOENT ? 127 : 126);
}
