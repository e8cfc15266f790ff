#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
        std::printf("edgeserve %s\n", EDGE_VERSION);
        return 0;
    }
    std::fprintf(stderr, "usage: edgeserve --version\n");
    return 2;
}
