#pragma once

// Test helpers: temporary directories, whole-file reads, and certificates generated at test time
// with OpenSSL (EC P-256 keys, self-signed certificates with DNS subjectAltNames). Nothing is
// embedded. Not thread-safe; call from the test's thread.

#include <string>
#include <vector>

struct evp_pkey_st;  // OpenSSL's EVP_PKEY.
struct ssl_ctx_st;   // OpenSSL's SSL_CTX.

namespace edge::testing {

// A fresh directory under $TMPDIR, removed (recursively) on destruction.
class TempDir {
public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }
    std::string file(const std::string& name) const { return path_ + "/" + name; }
    // Writes `contents` to `name` and returns the full path.
    std::string write(const std::string& name, const std::string& contents) const;

private:
    std::string path_;
};

// The whole file at `path` as bytes; a file that cannot be read fails the test's invariant.
std::string read_file(const std::string& path);

// Writes `key` (an EVP_PKEY*) to `path` as an unencrypted PEM private key, mode 0600 (the daemon
// refuses a key every user may read). Every certificate maker below writes its key with it.
void write_private_key(const std::string& path, evp_pkey_st* key);

struct TestCertificate {
    std::string cert_path;
    std::string key_path;
    std::string common_name;
};

// Writes `<dir>/<stem>.crt` and `<dir>/<stem>.key`: a self-signed certificate for `dns_names`
// (the first is the common name), valid from one hour ago for two days. Aborts the test on error.
TestCertificate make_certificate(const std::string& dir, const std::string& stem,
                                 const std::vector<std::string>& dns_names);

// Rewrites the PEM private key at `key_path` encrypted (PKCS#8, AES-256) with `passphrase`, as
// `openssl pkey -aes256` would. Aborts the test on error.
void encrypt_private_key(const std::string& key_path, const std::string& passphrase);

// A certificate authority made at test time (a cluster CA): `<dir>/<stem>.crt` and `.key`.
struct TestCa {
    std::string cert_path;
    std::string key_path;
};
TestCa make_ca(const std::string& dir, const std::string& stem, const std::string& common_name);

// Writes `<dir>/<stem>.crt` and `.key`: a certificate for `dns_names` (the first is the common
// name) and IP 127.0.0.1, signed by `ca`, usable as TLS server and client certificate.
TestCertificate make_signed_certificate(const TestCa& ca, const std::string& dir,
                                        const std::string& stem,
                                        const std::vector<std::string>& dns_names);

// A TLS server context (an SSL_CTX the caller frees) serving `cert`'s chain and key: the TLS end
// of a raw peer whose bytes a test writes itself. Aborts the test on error.
ssl_ctx_st* make_server_context(const TestCertificate& cert);

}  // namespace edge::testing
