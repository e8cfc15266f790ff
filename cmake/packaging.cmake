# Install layout and the Debian package (CPack DEB).
#
#   cmake --install build --prefix /usr      (or DESTDIR=/scratch cmake --install build ...)
#   cpack --config build/CPackConfig.cmake   -> edgeserve_<version>_amd64.deb
#
# PREFIX/bin/edgeserve; PREFIX/lib/systemd/system/edgeserve.{service,socket} (the unit names the
# installed binary); PREFIX/lib/sysusers.d/edgeserve.conf and PREFIX/lib/tmpfiles.d/edgeserve.conf;
# /etc/edgeserve/edgeserve.yaml (always under /etc: the unit reads it there); the Grafana dashboard
# and Prometheus files under PREFIX/share/edgeserve/; the operator docs under
# PREFIX/share/doc/edgeserve/.

include(GNUInstallDirs)
# `ninja install` and cpack install what is built; they do not build every test and bench first.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

install(TARGETS edgeserve RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The unit in the tree names the default prefix; the installed one names the real binary.
install(CODE "
    set(_unit_dir \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\")
    file(READ \"${PROJECT_SOURCE_DIR}/systemd/edgeserve.service\" _unit)
    string(REPLACE \"/usr/local/bin/edgeserve\"
                   \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/edgeserve\"
                   _unit \"\${_unit}\")
    file(MAKE_DIRECTORY \"\${_unit_dir}\")
    file(WRITE \"\${_unit_dir}/edgeserve.service\" \"\${_unit}\")
    message(STATUS \"Installing: \${_unit_dir}/edgeserve.service\")
    list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${_unit_dir}/edgeserve.service\")
")
install(FILES systemd/edgeserve.socket DESTINATION lib/systemd/system)
install(FILES systemd/edgeserve.sysusers.conf DESTINATION lib/sysusers.d RENAME edgeserve.conf)
install(FILES systemd/edgeserve.tmpfiles.conf DESTINATION lib/tmpfiles.d RENAME edgeserve.conf)
# The config is the operator's once installed: a re-run of `cmake --install` (an upgrade without
# the package) must not put the example back over it. The .deb ships it as a conffile.
install(CODE "
    if(EXISTS \"\$ENV{DESTDIR}/etc/edgeserve/edgeserve.yaml\")
        message(STATUS \"Keeping: \$ENV{DESTDIR}/etc/edgeserve/edgeserve.yaml (as edited)\")
    else()
        file(INSTALL DESTINATION /etc/edgeserve TYPE FILE
             FILES \"${PROJECT_SOURCE_DIR}/deploy/config/edgeserve.yaml\")
    endif()
")
install(FILES deploy/grafana/edgeserve.json DESTINATION ${CMAKE_INSTALL_DATADIR}/edgeserve/grafana)
install(FILES deploy/prometheus/prometheus.yml deploy/prometheus/alerts.yml
              deploy/prometheus/alerts_test.yml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/edgeserve/prometheus)
install(FILES README.md docs/api.md docs/architecture.md docs/benchmarks.md
              docs/cluster-certs.md docs/config.md docs/operations.md docs/quantization.md
              docs/sharding.md docs/tool_calls.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "edgeserve")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_VENDOR "edgeserve")
set(CPACK_PACKAGE_CONTACT "edgeserve maintainers <ops@edgeserve.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "edge inference daemon for Mixture-of-Experts LLMs")
set(CPACK_PACKAGE_DESCRIPTION
    "One point of presence of an edge network serving large MoE language models over an\n"
    "OpenAI-compatible HTTPS API, with systemd units, Prometheus alerts and a Grafana dashboard.")
# Stage with DESTDIR so /etc/edgeserve lands inside the package, not on the build host; with
# DESTDIR staging the prefix is CPACK_INSTALL_PREFIX.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX "/usr")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME "DEB-DEFAULT")
set(CPACK_DEBIAN_PACKAGE_SECTION "net")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
# Runtime libraries come from dpkg-shlibdeps on the binary.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "systemd | adduser")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "openssl")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "prometheus, grafana")
set(CPACK_DEBIAN_COMPRESSION_TYPE "gzip")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${PROJECT_SOURCE_DIR}/deploy/package/conffiles"
    "${PROJECT_SOURCE_DIR}/deploy/package/postinst"
    "${PROJECT_SOURCE_DIR}/deploy/package/prerm"
    "${PROJECT_SOURCE_DIR}/deploy/package/postrm")
include(CPack)
