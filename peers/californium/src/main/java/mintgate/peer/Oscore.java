package mintgate.peer;

import org.eclipse.californium.cose.AlgorithmID;
import org.eclipse.californium.oscore.OSCoreCtx;

/**
 * The OSCORE security context both peer programs build from their command
 * line: AES-CCM-16-64-128 and HKDF-SHA-256 (RFC 8613 3.2's defaults), a
 * replay window of 32, no ID Context.
 */
final class Oscore {
    private Oscore() {}

    static byte[] hex(String s) {
        if (s.equals("-")) {
            return new byte[0];
        }
        byte[] b = new byte[s.length() / 2];
        for (int i = 0; i < b.length; i++) {
            b[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        }
        return b;
    }

    /** secret, salt, sender id, recipient id in hex ("-": empty). */
    static OSCoreCtx context(boolean client, String secret, String salt, String sid, String rid)
            throws Exception {
        return new OSCoreCtx(hex(secret), client, AlgorithmID.AES_CCM_16_64_128, hex(sid), hex(rid),
                AlgorithmID.HKDF_HMAC_SHA_256, 32, hex(salt), null, 1024);
    }
}
