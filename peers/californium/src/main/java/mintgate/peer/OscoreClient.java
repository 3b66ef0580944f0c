package mintgate.peer;

import org.eclipse.californium.core.CoapClient;
import org.eclipse.californium.core.CoapResponse;
import org.eclipse.californium.core.coap.CoAP.Code;
import org.eclipse.californium.core.coap.Request;
import org.eclipse.californium.core.config.CoapConfig;
import org.eclipse.californium.elements.config.Configuration;
import org.eclipse.californium.elements.config.UdpConfig;
import org.eclipse.californium.oscore.HashMapCtxDB;
import org.eclipse.californium.oscore.OSCoreCoapStackFactory;

/**
 * Californium's OSCORE client (cf-oscore), for mintgate's interop tests:
 *
 * <pre>OscoreClient BASE_URI SECRET SALT SENDER_ID RECIPIENT_ID REQUEST...</pre>
 *
 * (hex; "-" for empty; BASE_URI is coap://HOST:PORT). Each REQUEST is
 * METHOD:PATH[:PAYLOAD] with METHOD GET or PUT, protected with that
 * context, or plain-GET / plain-PUT for an unprotected one. They go in
 * order from one process, so that the sender sequence number keeps
 * growing (a second process would start it again at 0, which a server
 * rightly takes as a replay). Prints one line per request: the answer's
 * code, a tab, its text ("none" when no answer came within 10 s).
 */
public final class OscoreClient {
    private OscoreClient() {}

    public static void main(String[] a) throws Exception {
        CoapConfig.register();
        UdpConfig.register();
        // the defaults, without reading or writing Californium3.properties
        // in the working folder
        Configuration.setStandard(new Configuration());
        HashMapCtxDB db = new HashMapCtxDB();
        db.addContext(a[0], Oscore.context(true, a[1], a[2], a[3], a[4]));
        OSCoreCoapStackFactory.useAsDefault(db);
        for (int i = 5; i < a.length; i++) {
            String[] r = a[i].split(":", 3);
            boolean plain = r[0].startsWith("plain-");
            String method = plain ? r[0].substring(6) : r[0];
            CoapClient c = new CoapClient(a[0] + "/" + r[1]);
            c.setTimeout(10_000L);
            Request req = new Request(method.equals("PUT") ? Code.PUT : Code.GET);
            if (r.length > 2) {
                req.setPayload(r[2]);
            }
            if (!plain) {
                req.getOptions().setOscore(new byte[0]);
            }
            CoapResponse resp = c.advanced(req);
            if (resp == null) {
                System.out.println("none");
            } else {
                System.out.println(resp.getCode().toString() + "\t" + resp.getResponseText());
            }
            c.shutdown();
        }
        System.exit(0);
    }
}
